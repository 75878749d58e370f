"""Make a disguised copy of a task: what a contaminated generator would emit."""
import ast
import builtins

KEEP = {"torch", "nn", "F", "math", "self", "Model", "forward", "__init__", "get_inputs", "get_init_inputs",
        *dir(builtins)}


class _Disguise(ast.NodeTransformer):
    def __init__(self, assigned_attributes, renumber: bool = True):
        self.attributes, self.renumber = assigned_attributes, renumber

    def _new(self, name):
        return name if name in KEEP else f"renamed_{name}"

    def visit_Name(self, node):
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._new(node.arg)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr in self.attributes:
            node.attr = f"renamed_{node.attr}"
        return node

    def visit_Constant(self, node):
        if self.renumber and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            node.value = node.value * 2 + 1 if isinstance(node.value, int) else node.value * 1.5
        return node

    def visit_FunctionDef(self, node):
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_ClassDef = visit_FunctionDef


def disguise(code: str, renumber: bool = True) -> str:
    """Rename every local name and attribute, change every number (unless `renumber` is
    False: then the computation is unchanged), drop docstrings and reformat (ast.unparse
    puts every statement in its canonical layout)."""
    tree = ast.parse(code)
    imported = {alias.asname or alias.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for alias in n.names}
    attributes = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Attribute)}
    KEEP.update(imported)
    return ast.unparse(_Disguise(attributes, renumber).visit(tree))


# -- one disguise of each kind, for decontamination's tests and benchmark -------------------

def products(code: str) -> str:
    """Module-level sizes written as products or sums: `batch_size = 64 * 2`."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, int) and not isinstance(node.value.value, bool) and node.value.value > 1:
            n = node.value.value
            node.value = (ast.BinOp(ast.Constant(n // 2), ast.Mult(), ast.Constant(2)) if n % 2 == 0
                          else ast.BinOp(ast.Constant(n - 1), ast.Add(), ast.Constant(1)))
    return ast.unparse(tree)


def aliased(code: str) -> str:
    """`import torch.nn.functional as fn`, `from torch import nn as tnn`."""
    tree = ast.parse(code)
    renames = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.nn.functional":
                    renames[alias.asname or alias.name] = alias.asname = "fn"
    body = []
    for node in tree.body:
        if isinstance(node, ast.Import) and [a.name for a in node.names] == ["torch.nn"]:
            renames[node.names[0].asname or "torch.nn"] = "tnn"
            node = ast.ImportFrom("torch", [ast.alias("nn", "tnn")], 0)
        body.append(node)
    tree.body = body
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in renames:
            node.id = renames[node.id]
    return ast.unparse(tree)


def identity(code: str) -> str:
    """One extra identity op before forward returns: `result = result * 1.0`."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    last = forward.body[-1]
    if isinstance(last, ast.Return) and last.value is not None and not isinstance(last.value, ast.Tuple):
        forward.body[-1:] = ast.parse("result = VALUE\nresult = result * 1.0\nreturn result").body
        forward.body[-3].value = last.value
    return ast.unparse(tree)


def helper(code: str) -> str:
    """forward's body moved into a helper method that forward calls."""
    return _delegated(code, lambda names: f"return self.compute({', '.join(names)})")


def _delegated(code: str, forward_body) -> str:
    """forward's body moved into a method `compute`; forward's new body is
    `forward_body(its argument names)`."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    compute = ast.parse(ast.unparse(forward)).body[0]
    compute.name = "compute"
    forward.body = ast.parse(forward_body([a.arg for a in forward.args.args[1:]])).body
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    model.body.append(compute)
    return ast.unparse(tree)


def reordered(code: str) -> str:
    """Definitions in another order: input builders first, the model, sizes last; and the
    model's methods reversed."""
    tree = ast.parse(code)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    rest = [n for n in tree.body if n not in imports + functions + classes]
    for cls in classes:
        cls.body.reverse()
    tree.body = imports + functions + classes + rest
    return ast.unparse(tree)


def renamed(code: str) -> str:
    """Every local name and attribute renamed, docstrings dropped, reformatted; the numbers
    kept, so the computation is the same."""
    return disguise(code, renumber=False)


def everything(code: str) -> str:
    """Every kind above at once, the computation unchanged."""
    return products(aliased(identity(helper(reordered(renamed(code))))))


# -- rewrites: the same computation in other ops, or in a form the tracer cannot follow ----------

# An activation written out in the ops it is made of; each a lambda so its argument runs once.
WRITTEN_OUT = {
    "gelu": "(lambda t: 0.5 * t * (1.0 + torch.erf(t / 1.4142135623730951)))",
    "silu": "(lambda t: t * (1.0 / (1.0 + torch.exp(-t))))",
    "sigmoid": "(lambda t: 1.0 / (1.0 + torch.exp(-t)))",
    "relu": "(lambda t: torch.clamp(t, min=0.0))",
    "mish": "(lambda t: t * torch.tanh(torch.log(1.0 + torch.exp(t))))",
    "softplus": "(lambda t: torch.log(1.0 + torch.exp(t)))",
    "softmax": "(lambda t: (lambda e: e / e.sum(dim=DIM, keepdim=True))(torch.exp(t - t.amax(dim=DIM, keepdim=True))))",
}


class _WriteOut(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else None
        root = func.value if isinstance(func, ast.Attribute) else None
        while isinstance(root, ast.Attribute):  # torch.nn.functional.gelu: an API call, not a method
            root = root.value
        on_tensor = isinstance(func, ast.Attribute) and not (isinstance(root, ast.Name)
                                                             and root.id in ("torch", "F", "nn"))
        if name not in WRITTEN_OUT or (on_tensor and name in ("softmax",)):
            return node
        args = ([func.value] if on_tensor else []) + node.args
        if not args or (on_tensor and isinstance(func.value, ast.Name) and func.value.id in ("self",)):
            return node
        dim = next((k.value for k in node.keywords if k.arg == "dim"), args[1] if len(args) > 1 else ast.Constant(-1))
        written = ast.parse(WRITTEN_OUT[name].replace("DIM", ast.unparse(dim)), mode="eval").body
        return ast.copy_location(ast.Call(written, [args[0]], []), node)


def written_out(code: str) -> str:
    """Every functional activation (F.gelu, torch.sigmoid, x.relu(), torch.softmax, ...)
    written as the ops it is made of: the same function, other ops on the page."""
    return ast.unparse(_WriteOut().visit(ast.parse(code)))


def guarded(code: str) -> str:
    """forward's body under a condition on the data that always holds: a tracer on the meta
    device has no value to decide it by."""
    tree = ast.parse(code)
    forward = _method(tree, "forward")
    first = forward.args.args[1].arg
    condition = ast.parse(f"if {first}.sum() == {first}.sum():\n    pass\nreturn {first}").body
    condition[0].body = forward.body
    forward.body = condition
    return ast.unparse(tree)


def split(code: str) -> str:
    """The batch computed in two halves and concatenated: every op appears twice."""
    def halves(names):
        first, rest = names[0], "".join(f", {n}" for n in names[1:])
        return (f"half = {first}.shape[0] // 2\n"
                f"return torch.cat([self.compute({first}[:half]{rest}), self.compute({first}[half:]{rest})], dim=0)")
    return _delegated(code, halves)


def rewritten(code: str) -> str:
    """Every rewrite above at once, renamed too."""
    return split(guarded(written_out(renamed(code))))


KINDS = {"products": products, "aliased": aliased, "identity": identity, "helper": helper, "reordered": reordered,
         "renamed": renamed, "renumbered": disguise, "everything": everything}
REWRITES = {"written_out": written_out, "guarded": guarded, "split": split, "rewritten": rewritten}


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    return next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == name)

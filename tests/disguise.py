"""Make a disguised copy of a task: what a contaminated generator would emit."""
import ast
import builtins

KEEP = {"torch", "nn", "F", "math", "self", "Model", "forward", "__init__", "get_inputs", "get_init_inputs",
        *dir(builtins)}


class _Disguise(ast.NodeTransformer):
    def __init__(self, assigned_attributes):
        self.attributes = assigned_attributes

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
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            node.value = node.value * 2 + 1 if isinstance(node.value, int) else node.value * 1.5
        return node

    def visit_FunctionDef(self, node):
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_ClassDef = visit_FunctionDef


def disguise(code: str) -> str:
    """Rename every local name and attribute, change every number, drop docstrings and
    reformat (ast.unparse puts every statement in its canonical layout)."""
    tree = ast.parse(code)
    imported = {alias.asname or alias.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for alias in n.names}
    attributes = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Attribute)}
    KEEP.update(imported)
    return ast.unparse(_Disguise(attributes).visit(tree))

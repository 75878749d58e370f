"""What an accepted row's trace says it computes is what its stored code computes. The policy
lets forward branch on a shape; a red team's task ran a KernelBench layer (Linear, ReLU) at a
batch over 128 and decoy ops below it. Too fast at its batch of 64, it was re-sized to 256 by
the timing check and accepted by a WorkerPool, and its trace, made of the code as submitted,
read the decoy: decontamination would have compared the decoy with KernelBench."""
from tests.conftest import make_task

LINEAR = "self.linear = nn.Linear(features, features)"
DECOY = make_task("if x.shape[0] > 128:\n    return torch.relu(self.linear(x)) * 2.0\n"
                  "return torch.cumsum(torch.tanh(x), dim=1) + torch.sigmoid(x)", init=LINEAR)


def test_an_accepted_task_is_traced_at_the_sizes_it_is_stored_at(pool):
    [result] = pool.run_many([{"code": DECOY, "config": {"compile": False}}])
    assert result["passed"] and result["metrics"]["resized"], result
    assert "batch_size = 64" not in result["code"]
    assert result["metrics"]["op_graph"] == "mm add relu mul", result["metrics"]["op_graph"]


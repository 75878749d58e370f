"""What a task computes, whatever its spelling: the canonical ATen op sequence of one forward
call (`graph.op_graph`). The checks trace it in the sandbox (filters/checks/harness.py) and
decontamination compares it (filters/similarity/); nothing here runs a task's code of its own
accord, loads a task or imports the sandbox: it is given a built model and its inputs.

- graph.py: the entry, `op_graph` and `op_graph_and_drops`: one reading or two, and which stands;
- record.py: the dispatch mode that records every op and what made each tensor it reads;
- memory.py: where tensors lie in their storage, and whether two views share an element;
- names.py: one name per op (`canonical`), the norms, and the composites' decompositions;
- values.py: when two values are one (`close`);
- equivalences.py: the recorded ops read from their values (`_Equivalences`);
- recognise.py: what a value computes of earlier ones (composites, affine maps, contractions).
"""

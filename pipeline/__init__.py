"""The Beam graph, the CLI, the run configuration and the composers."""

"""One request from its client key to its answer: the steps around routing."""

"""Choosing among a model group's deployments: strategies (pure) and their live stats."""

"""Thin HTTP routes: read the request, hand it to the pipeline, write the reply."""

"""Typed configuration: the file read, validated and compared."""

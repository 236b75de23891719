"""Limit kinds beyond the built-in ones, one module each that calls ``limit_kinds.register``
(``proxy/config/limit_kinds.py`` imports every module here when it is first imported)."""

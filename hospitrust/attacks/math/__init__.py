"""The attacks' math as pure functions: ``update`` (model poisoning, torch) and ``data`` (data poisoning and faults, numpy)."""

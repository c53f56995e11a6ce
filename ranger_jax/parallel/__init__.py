"""Meshes ("data", "fsdp", "tensor"), the logical-axis partition rules, and placing models onto meshes."""

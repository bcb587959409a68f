"""One module per Triton kernel. ``codegen`` needs no triton; the others import it."""

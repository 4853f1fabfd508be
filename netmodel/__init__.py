"""netmodel package."""

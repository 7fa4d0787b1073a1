"""installdir."""

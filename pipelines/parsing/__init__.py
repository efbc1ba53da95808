"""English constituency parsing (section 6.3): trees, linearisation and scoring."""

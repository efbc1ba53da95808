"""Importers of models trained elsewhere into run folders (`kt import`)."""

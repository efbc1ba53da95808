"""Translating strings in-graph, the SavedModel for TF Serving, CTranslate2 conversion."""

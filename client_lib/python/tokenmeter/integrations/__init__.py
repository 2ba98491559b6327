"""Adapters that make inference engines report to tokenmeterd unpatched."""

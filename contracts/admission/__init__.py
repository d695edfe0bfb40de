"""Admission filters for the schedulers, generated from the signed contract bundle."""

"""Grading models (tasks, certifications, gradings) — built in a later increment."""

"""The embedded demo model's folder: what ``slotserve serve`` runs when no model is given."""

from pathlib import Path

DEMO_MODEL = Path(__file__).resolve().parent / "demo_model"

"""Choosing the right ending: SWAG and HellaSwag (`registry.MULTIPLE_CHOICE`)."""

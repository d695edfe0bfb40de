"""The lifecycle workflow: voluntary replacements of one region's instances, in budget."""

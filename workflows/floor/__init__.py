"""The floor keeper: committed capacity held for one tier-1 contract in one region."""

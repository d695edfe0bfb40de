"""The provider boundary: instances, capacity and committed reservations of one region."""

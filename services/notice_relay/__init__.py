"""The notice relay of one hall: reclaims → signed notices → deletes at the deadline."""

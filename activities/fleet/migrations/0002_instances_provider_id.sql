-- The notice relay maps the provider's reclaim decisions (by provider id) to instances.
CREATE INDEX instances_provider_id ON instances (provider_id) WHERE provider_id IS NOT NULL;

-- Instances that must carry a given hostname: Slurm CLOUD nodes, whose node name is the
-- hostname the ResumeProgram asked for. SuspendProgram and ResumeFailProgram find the
-- instances behind a node by it.
ALTER TABLE instances ADD COLUMN hostname text;
CREATE INDEX instances_hostname ON instances (region, hostname) WHERE hostname IS NOT NULL;

-- Why the acquisition's pools were chosen over the others (planning/choice.py): the
-- controller's ranked pools chosen and passed over with the planner's reason for each, or
-- the floor keeper's / lifecycle workflow's own reason. NULL: recorded before SCO kept it.
-- `sco explain instance` and `sco explain pool` read it; nothing plans from it.
ALTER TABLE acquisitions ADD COLUMN choice jsonb;

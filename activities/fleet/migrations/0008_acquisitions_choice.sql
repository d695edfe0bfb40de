-- Why the acquisition's pools were chosen over the others (planning/choice.py): the
-- controller's ranked pools chosen and passed over with the planner's reason for each, or
-- the floor keeper's / lifecycle workflow's own reason. NULL: recorded before SCO kept it.
-- `sco explain instance` and `sco explain pool` read it; nothing plans from it.
ALTER TABLE acquisitions ADD COLUMN choice jsonb;
-- `sco explain pool P`: the newest acquisition that passed P over (containment on the
-- pool id), without reading every acquisition of the last week.
CREATE INDEX acquisitions_passed_over ON acquisitions
    USING gin ((choice -> 'passed_over') jsonb_path_ops);

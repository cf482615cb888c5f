-- The admin API's long jobs (room deletion): one row per job, written by the
-- process running it after each step, so that any process answers its
-- status and the main process resumes an unfinished job after a restart.
--   action:      what the job does ("delete_room");
--   resource_id: what it acts on (the room id);
--   params:      JSON, what the admin asked;
--   status:      scheduled, active, complete or failed;
--   result:      JSON, what the steps done so far did (and where a step that
--                works in batches got to);
--   error:       why it failed (status failed).
CREATE TABLE admin_tasks (
    task_id TEXT NOT NULL PRIMARY KEY,
    action TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT NOT NULL,
    error TEXT,
    created_ts BIGINT NOT NULL,
    updated_ts BIGINT NOT NULL
);
CREATE INDEX admin_tasks_resource ON admin_tasks (resource_id);
CREATE INDEX admin_tasks_status ON admin_tasks (status);

-- Rooms an admin blocked: no local user may join, knock or be invited.
CREATE TABLE blocked_rooms (
    room_id TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL
);

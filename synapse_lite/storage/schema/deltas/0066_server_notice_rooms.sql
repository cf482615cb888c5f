-- The room server notices to a user are sent in (POST
-- /_synapse/admin/v1/send_server_notice): made by the system user on the
-- first notice, replaced when the user has left it.
CREATE TABLE server_notice_rooms (
    user_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL
);

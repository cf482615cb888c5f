-- Third-party identifiers a local user bound through this server at an
-- identity server (POST /account/3pid/bind): what /3pid/delete, /3pid/unbind
-- and deactivation unbind, and where. Plain rows, written by whichever
-- process served the request (no stream: nothing caches them).
CREATE TABLE user_threepid_id_server (
    user_id TEXT NOT NULL,
    medium TEXT NOT NULL,
    address TEXT NOT NULL,
    id_server TEXT NOT NULL,
    PRIMARY KEY (user_id, medium, address, id_server)
);

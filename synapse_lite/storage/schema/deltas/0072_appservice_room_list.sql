-- The rooms an application service publishes in the room directory of one of
-- its networks (``PUT /directory/list/appservice/{networkId}/{roomId}``), kept
-- apart from the server's own list (``rooms.in_directory``). ``/publicRooms``
-- shows them for ``third_party_instance_id`` ``<as_id>|<network_id>`` or
-- ``include_all_networks`` (docs/appservices.md#published-room-lists).
CREATE TABLE appservice_room_list (
    appservice_id TEXT NOT NULL,
    network_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    PRIMARY KEY (appservice_id, network_id, room_id)
);
CREATE INDEX appservice_room_list_room ON appservice_room_list (room_id);

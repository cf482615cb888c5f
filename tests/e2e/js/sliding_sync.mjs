// The real matrix-js-sdk's SlidingSync (MSC4186, as Element Web's sliding
// sync mode runs it, with Rust crypto) against the server: a room list and a
// room subscription; the list in recency order; a new message moves its room
// to the top and arrives in the timeline; the to_device and e2ee extensions
// answered. Prints what it saw, as JSON.
// Usage: node sliding_sync.mjs BASE_URL ALICE_JSON BOB_JSON ROOMS_JSON
// where each *_JSON login is {"user_id", "access_token", "device_id"} and
// ROOMS_JSON the rooms they share, oldest activity first.
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { SlidingSync, SlidingSyncEvent, SlidingSyncState } from "matrix-js-sdk/lib/sliding-sync.js";

logger.setLevel("warn");
const [baseUrl, aliceJson, bobJson, roomsJson] = process.argv.slice(2);
const rooms = JSON.parse(roomsJson);
const TIMEOUT_MS = 30_000;

function client(login) {
  const { user_id: userId, access_token: accessToken, device_id: deviceId } = JSON.parse(login);
  return sdk.createClient({ baseUrl, userId, accessToken, deviceId });
}

// Resolves with the first value check() returns that is not undefined,
// checked now and on each sliding sync response.
function until(slidingSync, what, check) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), TIMEOUT_MS);
    const test = () => {
      const value = check();
      if (value === undefined) return;
      clearTimeout(timer);
      slidingSync.off(SlidingSyncEvent.Lifecycle, onResponse);
      resolve(value);
    };
    const onResponse = (state) => {
      if (state === SlidingSyncState.Complete) setImmediate(test);
    };
    slidingSync.on(SlidingSyncEvent.Lifecycle, onResponse);
    test();
  });
}

// The rooms the client knows, newest activity first (as Element orders them).
function byRecency(alice) {
  return rooms
    .map((roomId) => alice.getRoom(roomId))
    .filter((room) => room && room.getBumpStamp() !== undefined)
    .sort((a, b) => b.getBumpStamp() - a.getBumpStamp())
    .map((room) => room.roomId);
}

const alice = client(aliceJson);
const bob = client(bobJson);
await alice.initRustCrypto({ useIndexedDB: false });

const responses = [];
const errors = [];
const lists = new Map([
  [
    "all",
    {
      ranges: [[0, 19]],
      timeline_limit: 1,
      required_state: [
        ["m.room.name", ""],
        ["m.room.encryption", ""],
        ["m.room.member", "$ME"],
      ],
    },
  ],
]);
const subscription = { timeline_limit: 10, required_state: [["*", "*"]] };
const slidingSync = new SlidingSync(baseUrl, lists, subscription, alice, 2000);
slidingSync.on(SlidingSyncEvent.Lifecycle, (state, resp, err) => {
  if (err) errors.push(String(err.httpStatus ?? err));
  if (state === SlidingSyncState.RequestFinished && resp) responses.push(resp);
});
await alice.startClient({ slidingSync });
const result = {};

// 1. The room list, newest first.
result.first_order = await until(slidingSync, "the room list", () => {
  const order = byRecency(alice);
  return order.length === rooms.length ? order : undefined;
});
result.count = slidingSync.getListData("all").joinedCount;

// 2. Bob's message in the oldest room: it arrives and the room goes on top.
const oldest = rooms[0];
const { event_id: sentId } = await bob.sendTextMessage(oldest, "to the top");
result.arrived = await until(slidingSync, "bob's message", () => {
  const events = alice.getRoom(oldest)?.getLiveTimeline().getEvents() ?? [];
  return events.some((e) => e.getId() === sentId) ? true : undefined;
});
result.after_order = byRecency(alice);

// 3. A room subscription: the opened room's timeline grows to its limit.
const opened = rooms[1];
const before = alice.getRoom(opened).getLiveTimeline().getEvents().length;
slidingSync.modifyRoomSubscriptions(new Set([opened]));
result.subscribed_timeline = await until(slidingSync, "the subscription's timeline", () => {
  const sent = responses.find((r) => (r.rooms?.[opened]?.timeline?.length ?? 0) > 1);
  return sent ? sent.rooms[opened].timeline.length : undefined;
});
result.timeline_before = before;
result.timeline_after = alice.getRoom(opened).getLiveTimeline().getEvents().length;
result.expanded = responses.some((r) => r.rooms?.[opened]?.expanded_timeline === true);

// 4. to_device: bob's message reaches alice's device through the extension.
const toDevice = new Promise((resolve) => {
  alice.on(sdk.ClientEvent.ToDeviceEvent, (event) => {
    if (event.getType() === "org.example.ping") resolve(event.getContent());
  });
});
await bob.queueToDevice({
  eventType: "org.example.ping",
  batch: [{ userId: alice.getUserId(), deviceId: alice.getDeviceId(), payload: { n: 1 } }],
});
result.to_device = await Promise.race([
  toDevice,
  new Promise((_, reject) => setTimeout(() => reject(new Error("no to-device message")), TIMEOUT_MS)),
]);

// 5. e2ee: alice's crypto uploaded one-time keys (the extension counts
// them); bob's new device keys show up as a device list change.
await bob.http.authedRequest(sdk.Method.Post, "/keys/upload", undefined, {
  device_keys: {
    user_id: bob.getUserId(),
    device_id: bob.getDeviceId(),
    algorithms: ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
    keys: {
      [`curve25519:${bob.getDeviceId()}`]: "bobcurve",
      [`ed25519:${bob.getDeviceId()}`]: "bobed",
    },
    signatures: { [bob.getUserId()]: { [`ed25519:${bob.getDeviceId()}`]: "sig" } },
  },
});
result.device_list_changed = await until(slidingSync, "bob's device list change", () =>
  responses.some((r) => (r.extensions?.e2ee?.device_lists?.changed ?? []).includes(bob.getUserId()))
    ? true
    : undefined,
);
result.one_time_keys = await until(slidingSync, "alice's one-time key count", () => {
  const counts = responses.map((r) => r.extensions?.e2ee?.device_one_time_keys_count?.signed_curve25519 ?? 0);
  const most = Math.max(0, ...counts);
  return most > 0 ? most : undefined;
});
result.extensions_asked = Object.keys(responses[0]?.extensions ?? {}).sort();
result.errors = errors;
alice.stopClient();
console.log(JSON.stringify(result));
process.exit(0);

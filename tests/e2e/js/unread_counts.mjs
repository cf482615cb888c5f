// The real matrix-js-sdk client reads the server's unread counts of a room
// (what Element shows as a room's badge): after messages and a mention, then
// after its own read receipt and one more message. Prints JSON.
// Usage: node unread_counts.mjs BASE_URL ALICE_LOGIN_JSON BOB_LOGIN_JSON ROOM_ID
import * as sdk from "matrix-js-sdk";

const [baseUrl, aliceLogin, bobLogin, roomId] = process.argv.slice(2);
const client = (login) => {
  const { user_id, access_token, device_id } = JSON.parse(login);
  return sdk.createClient({ baseUrl, accessToken: access_token, userId: user_id, deviceId: device_id });
};
const alice = client(aliceLogin);
const bob = client(bobLogin);

const counts = () => {
  const room = alice.getRoom(roomId);
  return room
    ? [room.getUnreadNotificationCount("total"), room.getUnreadNotificationCount("highlight")]
    : null;
};
const until = async (want, what) => {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    const now = counts();
    if (now && now[0] === want[0] && now[1] === want[1]) return now;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what}: counts ${JSON.stringify(counts())}, not ${JSON.stringify(want)}`);
};

const prepared = new Promise((resolve, reject) => {
  alice.on(sdk.ClientEvent.Sync, (state) => {
    if (state === "PREPARED") resolve();
    else if (state === "ERROR") reject(new Error("sync error"));
  });
});
await alice.startClient({ initialSyncLimit: 10 });
await prepared;
const first = counts();

const say = (body, extra = {}) =>
  bob.sendEvent(roomId, "m.room.message", { msgtype: "m.text", body, ...extra });
await say("one");
await say("two");
await say("alice?", { "m.mentions": { user_ids: [alice.getUserId()] } });
const afterMessages = await until([first[0] + 3, first[1] + 1], "after three messages");

const events = alice.getRoom(roomId).getLiveTimeline().getEvents();
await alice.sendReadReceipt(events[events.length - 1]);
await say("after the receipt");
const afterReceipt = await until([1, 0], "after the receipt and one message");

alice.stopClient();
console.log(JSON.stringify({ first, after_messages: afterMessages, after_receipt: afterReceipt }));
process.exit(0);

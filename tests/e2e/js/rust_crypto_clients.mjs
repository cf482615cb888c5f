// What the encrypted-chat scripts share: matrix-js-sdk clients with Rust
// crypto (initRustCrypto, as Element runs it), started and synced, and
// waiting for what they should see, with a deadline.
import * as sdk from "matrix-js-sdk";

const TIMEOUT_MS = 60_000;

// `promise`, or an error naming `what` after `ms`.
export function withTimeout(promise, what, ms = TIMEOUT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// A client of `baseUrl` for a login {user_id, access_token, device_id},
// with Rust crypto in memory, once its first sync is done.
export async function startClient(baseUrl, login) {
  const { user_id: userId, access_token: accessToken, device_id: deviceId } = login;
  const client = sdk.createClient({ baseUrl, userId, accessToken, deviceId });
  await client.initRustCrypto({ useIndexedDB: false });
  const prepared = new Promise((resolve) => {
    client.on(sdk.ClientEvent.Sync, (state) => {
      if (state === "PREPARED") resolve();
    });
  });
  // Short long-polls: the test's servers are stopped soon after the script ends.
  await client.startClient({ initialSyncLimit: 20, pollTimeout: 2000 });
  await withTimeout(prepared, `${userId}'s first sync`);
  return client;
}

// The body of the first decrypted message in roomId matching `wanted`.
export function decrypted(client, roomId, wanted) {
  return withTimeout(
    new Promise((resolve) => {
      const check = (event) => {
        if (event.getRoomId() !== roomId || event.getType() !== "m.room.message") return;
        if (!event.isEncrypted() || event.isDecryptionFailure()) return;
        if (event.getContent().body === wanted) resolve(wanted);
      };
      client.on(sdk.MatrixEventEvent.Decrypted, check);
      const room = client.getRoom(roomId);
      for (const event of room ? room.getLiveTimeline().getEvents() : []) check(event);
    }),
    `${client.getUserId()} to decrypt ${JSON.stringify(wanted)}`,
  );
}

// alice says "hello bob" in roomId and bob "hello alice", each once the
// other has decrypted the previous one: what each decrypted.
export async function chatBothWays(alice, bob, roomId) {
  const bobGets = decrypted(bob, roomId, "hello bob");
  await alice.sendTextMessage(roomId, "hello bob");
  const bobDecrypted = await bobGets;
  const aliceGets = decrypted(alice, roomId, "hello alice");
  await bob.sendTextMessage(roomId, "hello alice");
  return { bob_decrypted: bobDecrypted, alice_decrypted: await aliceGets };
}

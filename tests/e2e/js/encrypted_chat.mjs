// Two matrix-js-sdk clients with Rust crypto (initRustCrypto, as Element runs
// it) chat in an encrypted room and decrypt each other's messages; then alice
// sets up cross-signing (her device verified by it) and a key backup, and a new
// device of hers restores the room key from the backup and decrypts the history.
// Usage: node encrypted_chat.mjs BASE_URL ALICE_JSON BOB_JSON ALICE2_JSON PASSWORD
// where each *_JSON is {"user_id", "access_token", "device_id"}. Prints JSON.
import { logger } from "matrix-js-sdk/lib/logger.js";
import { chatBothWays, startClient, withTimeout } from "./rust_crypto_clients.mjs";

logger.setLevel("warn");
const [baseUrl, aliceJson, bobJson, alice2Json, password] = process.argv.slice(2);

async function joined(client, roomId) {
  await withTimeout(
    new Promise((resolve) => {
      const poll = () => {
        const room = client.getRoom(roomId);
        if (room && room.getMyMembership() === "join") resolve();
        else setTimeout(poll, 100);
      };
      poll();
    }),
    `${client.getUserId()} to see the room`,
  );
}

const start = (login) => startClient(baseUrl, JSON.parse(login));
const alice = await start(aliceJson);
const bob = await start(bobJson);
const result = {};

// 1. An encrypted room; each decrypts the other's message.
const { room_id: roomId } = await alice.createRoom({
  invite: [bob.getUserId()],
  initial_state: [
    { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
  ],
});
await joined(alice, roomId);
await withTimeout(
  new Promise((resolve) => {
    const poll = () => (bob.getRoom(roomId) ? resolve() : setTimeout(poll, 100));
    poll();
  }),
  "bob's invite",
);
await bob.joinRoom(roomId);
await joined(bob, roomId);
result.encrypted_room = await alice.getCrypto().isEncryptionEnabledInRoom(roomId);

Object.assign(result, await chatBothWays(alice, bob, roomId));

// 2. Cross-signing: alice's keys, her device signed by her self-signing key.
const crypto = alice.getCrypto();
await crypto.bootstrapCrossSigning({
  setupNewCrossSigning: true,
  authUploadDeviceSigningKeys: async (makeRequest) => {
    try {
      await makeRequest(null);
    } catch (e) {
      const session = e.data?.session;
      await makeRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: alice.getUserId() },
        password,
        session,
      });
    }
  },
});
const status = await crypto.getCrossSigningStatus();
result.cross_signing_ready = await crypto.isCrossSigningReady();
result.cross_signing_public_keys_on_device = status.publicKeysOnDevice;
// Verified once alice's client has fetched her device's new signature (her
// own device list changed: she hears it from /sync).
result.own_device_cross_signing_verified = await withTimeout(
  (async () => {
    for (;;) {
      const own = await crypto.getDeviceVerificationStatus(alice.getUserId(), alice.getDeviceId());
      if (own?.crossSigningVerified) return true;
      await new Promise((r) => setTimeout(r, 200));
    }
  })(),
  "alice's device to be verified by cross-signing",
).catch(() => false);
// Bob sees alice's master key.
const bobView = await bob.getCrypto().getUserDeviceInfo([alice.getUserId()], true);
result.bob_sees_alice_devices = bobView.get(alice.getUserId())?.size ?? 0;

// 3. Key backup: alice backs up the room key; a new device restores it.
await crypto.resetKeyBackup();
const current = await withTimeout(
  (async () => {
    for (;;) {
      const version = await alice.http.authedRequest("GET", "/room_keys/version");
      if (version.count > 0) return version;
      await new Promise((r) => setTimeout(r, 200));
    }
  })(),
  "the room key to be backed up",
);
result.backed_up_keys = current.count;
const backupInfo = current.version;
const backupKey = await crypto.getSessionBackupPrivateKey();

const alice2 = await start(alice2Json);
const crypto2 = alice2.getCrypto();
await crypto2.storeSessionBackupPrivateKey(backupKey, backupInfo);
const info = await crypto2.checkKeyBackupAndEnable();
const restored = await crypto2.restoreKeyBackup();
result.restored_keys = restored.imported;
result.restored_version_matches = info?.backupInfo?.version === backupInfo;

for (const client of [alice, bob, alice2]) client.stopClient();
console.log(JSON.stringify(result));
process.exit(0);

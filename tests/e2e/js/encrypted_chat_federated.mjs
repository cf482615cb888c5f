// Two matrix-js-sdk clients with Rust crypto (initRustCrypto, as Element runs
// it), each on its own homeserver: alice (server A) creates an encrypted room
// and invites bob (server B); bob joins over federation; they exchange
// encrypted messages both ways; both set up cross-signing; then they verify
// each other with an interactive SAS verification in the room, and each sees
// the other as verified by cross-signing.
// Usage: node encrypted_chat_federated.mjs ALICE_JSON BOB_JSON
// where each *_JSON is {"base_url", "user_id", "access_token", "device_id",
// "password"}. Prints JSON: what each side saw (the test checks it).
import { CryptoEvent, VerificationPhase, VerifierEvent } from "matrix-js-sdk/lib/crypto-api/index.js";
import { logger } from "matrix-js-sdk/lib/logger.js";
import { chatBothWays, startClient, withTimeout } from "./rust_crypto_clients.mjs";

logger.setLevel("warn");
const [aliceJson, bobJson] = process.argv.slice(2);
// Each wait's deadline: the whole script takes a few seconds.
const TIMEOUT_MS = 30_000;
const result = { steps: [] };

function step(name) {
  result.steps.push(name);
}

// Resolves once check() (polled every 100 ms) is truthy; its value.
function until(check, what) {
  return withTimeout(
    (async () => {
      for (;;) {
        const value = await check();
        if (value) return value;
        await new Promise((r) => setTimeout(r, 100));
      }
    })(),
    what,
    TIMEOUT_MS,
  );
}

function joined(client, roomId) {
  return until(
    () => client.getRoom(roomId)?.getMyMembership() === "join",
    `${client.getUserId()} to be joined`,
  );
}

// Cross-signing keys made and uploaded (the password for the server's
// user-interactive auth, asked when the user replaces keys).
async function bootstrapCrossSigning(client, password) {
  await client.getCrypto().bootstrapCrossSigning({
    setupNewCrossSigning: true,
    authUploadDeviceSigningKeys: async (makeRequest) => {
      try {
        await makeRequest(null);
      } catch (e) {
        await makeRequest({
          type: "m.login.password",
          identifier: { type: "m.id.user", user: client.getUserId() },
          password,
          session: e.data?.session,
        });
      }
    },
  });
  return client.getCrypto().isCrossSigningReady();
}

// One side of a SAS verification: confirm the SAS shown (its decimals
// recorded) and wait for the verifier to finish.
async function runVerifier(verifier, side) {
  const shown = new Promise((resolve) => {
    verifier.on(VerifierEvent.ShowSas, (sas) => {
      result[`${side}_sas`] = sas.sas.decimal;
      resolve();
      sas.confirm();
    });
  });
  const what = `${side}'s SAS verification`;
  await withTimeout(Promise.all([verifier.verify(), shown]), what, TIMEOUT_MS);
}

const start = (login) => startClient(login.base_url, login);
const alice = await start(JSON.parse(aliceJson));
const bob = await start(JSON.parse(bobJson));
const aliceId = alice.getUserId();
const bobId = bob.getUserId();
const passwords = {
  [aliceId]: JSON.parse(aliceJson).password,
  [bobId]: JSON.parse(bobJson).password,
};

try {
  // 1. An encrypted room on A; bob (of B) invited and joining over federation.
  const { room_id: roomId } = await alice.createRoom({
    preset: "private_chat",
    invite: [bobId],
    initial_state: [
      { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
    ],
  });
  await joined(alice, roomId);
  await until(() => bob.getRoom(roomId)?.getMyMembership() === "invite", "bob's invite");
  step("invited");
  await bob.joinRoom(roomId);
  await joined(bob, roomId);
  await until(
    () => alice.getRoom(roomId)?.getMember(bobId)?.membership === "join",
    "alice to see bob joined",
  );
  step("joined");
  result.encrypted_room = await bob.getCrypto().isEncryptionEnabledInRoom(roomId);

  // 2. Encrypted messages both ways (device keys queried, one-time keys
  // claimed and olm to-device messages sent across servers).
  Object.assign(result, await chatBothWays(alice, bob, roomId));
  step("chatted");

  // 3. Cross-signing for both.
  result.alice_cross_signing_ready = await bootstrapCrossSigning(alice, passwords[aliceId]);
  result.bob_cross_signing_ready = await bootstrapCrossSigning(bob, passwords[bobId]);
  // Each sees the other's master key (signing key updates across servers).
  for (const [viewer, other, name] of [
    [alice, bobId, "alice_sees_bob_identity"],
    [bob, aliceId, "bob_sees_alice_identity"],
  ]) {
    result[name] = await until(
      () => viewer.getCrypto().userHasCrossSigningKeys(other, true),
      `${viewer.getUserId()} to see ${other}'s cross-signing keys`,
    ).catch(() => false);
  }
  step("cross-signing");

  // 4. Interactive SAS verification in the room: alice asks, bob accepts.
  const bobRequest = new Promise((resolve) => {
    bob.on(CryptoEvent.VerificationRequestReceived, (request) => resolve(request));
  });
  const aliceRequest = await alice.getCrypto().requestVerificationDM(bobId, roomId);
  const incoming = await withTimeout(
    bobRequest,
    "bob to receive the verification request",
    TIMEOUT_MS,
  );
  step("requested");
  await incoming.accept();
  await until(() => aliceRequest.phase === VerificationPhase.Ready, "alice's request to be ready");
  step("accepted");
  const aliceVerifier = await aliceRequest.startVerification("m.sas.v1");
  const bobVerifier = await until(() => incoming.verifier, "bob's verifier");
  await Promise.all([runVerifier(aliceVerifier, "alice"), runVerifier(bobVerifier, "bob")]);
  await until(
    () => aliceRequest.phase === VerificationPhase.Done && incoming.phase === VerificationPhase.Done,
    "both requests to be done",
  );
  step("verified");

  // 5. Each sees the other verified by cross-signing, and alice bob's device.
  const verified = (viewer, other) =>
    until(
      async () =>
        (await viewer.getCrypto().getUserVerificationStatus(other)).isCrossSigningVerified(),
      `${viewer.getUserId()} to see ${other} verified`,
    ).catch(() => false);
  result.alice_verified_bob = await verified(alice, bobId);
  result.bob_verified_alice = await verified(bob, aliceId);
  result.alice_verified_bob_device = await until(
    async () =>
      (await alice.getCrypto().getDeviceVerificationStatus(bobId, bob.getDeviceId()))
        ?.crossSigningVerified,
    "alice to see bob's device verified",
  ).catch(() => false);
  step("done");
} catch (e) {
  result.error = String(e?.stack ?? e);
}
for (const client of [alice, bob]) client.stopClient();
console.log(JSON.stringify(result));
process.exit(0);

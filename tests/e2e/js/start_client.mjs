// Starts the real matrix-js-sdk client (as Element does) and waits for its
// first sync; prints what it saw, as JSON.
// Usage: node start_client.mjs BASE_URL USER PASSWORD
import * as sdk from "matrix-js-sdk";

const [baseUrl, user, password] = process.argv.slice(2);



const login = await sdk.createClient({ baseUrl }).loginRequest({
  type: "m.login.password",
  identifier: { type: "m.id.user", user },
  password,
});
const client = sdk.createClient({
  baseUrl,
  accessToken: login.access_token,
  userId: login.user_id,
  deviceId: login.device_id,
});

const states = [];
const synced = new Promise((resolve, reject) => {
  const timer = setTimeout(
    () => reject(new Error(`no first sync within 30 s; states: ${states.join(", ")}`)),
    30_000,
  );
  client.on(sdk.ClientEvent.Sync, (state) => {
    states.push(state);
    if (state === "PREPARED" || state === "SYNCING") {
      clearTimeout(timer);
      resolve(state);
    } else if (state === "ERROR") {
      clearTimeout(timer);
      reject(new Error(`sync error; states: ${states.join(", ")}`));
    }
  });
});
await client.startClient({ initialSyncLimit: 5 });
const firstState = await synced;
const pushRules = client.pushRules;
const rules = await client.getPushRules();
client.stopClient();
console.log(
  JSON.stringify({
    first_state: firstState,
    states,
    client_push_rules: pushRules ? Object.keys(pushRules.global ?? {}).sort() : null,
    override_ids: rules.global.override.map((r) => r.rule_id),
    user_id: client.getUserId(),
  }),
);
process.exit(0);

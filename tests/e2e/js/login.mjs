// Logs in with the real matrix-js-sdk and prints what the server said, as JSON.
// Usage: node login.mjs BASE_URL USER PASSWORD
import * as sdk from "matrix-js-sdk";

const [baseUrl, user, password] = process.argv.slice(2);
const client = sdk.createClient({ baseUrl });
const versions = await client.getVersions();
const login = await client.loginRequest({
  type: "m.login.password",
  identifier: { type: "m.id.user", user },
  password,
});
const authed = sdk.createClient({
  baseUrl,
  accessToken: login.access_token,
  userId: login.user_id,
  deviceId: login.device_id,
});
const whoami = await authed.whoami();
console.log(JSON.stringify({ versions: versions.versions, login_user: login.user_id, whoami }));

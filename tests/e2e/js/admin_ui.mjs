// The admin UI (Ketesa, formerly synapse-admin; its built files served by the
// test) in headless Chromium against the server: log in, list and search the
// users, open one and each of its tabs, send them a server notice through its
// dialog, list the rooms, open one, list the event reports, create a
// registration token through its form.
//
// Usage: node admin_ui.mjs UI_URL HOMESERVER_URL ADMIN_USER PASSWORD USER_ID ROOM_NAME
// Prints one JSON line: what each page showed, and every call the UI made to
// the homeserver that answered >= 400 (the UI shows a failed list as an
// empty one, so the test fails on them rather than on what renders).
// CHROMIUM: the browser's path (default /usr/bin/chromium, Debian's).

import { chromium } from "playwright-core";

const [uiUrl, hsUrl, adminUser, password, userId, roomName] = process.argv.slice(2);
// Calls whose failure the UI expects: settings it may not find (an unset
// account data type, OIDC metadata of a server without it, a client
// discovery document the server has not been given).
const EXPECTED_FAILURES = [
  /^\/\.well-known\/matrix\/client$/,
  /\/account_data\/io\.element\.synapse\.admin_client_config$/,
  /\/auth_metadata$/,
];
const TIMEOUT_MS = 15000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
});
const result = { pages: {}, failed_calls: [], calls: 0, console_errors: [] };
const page = await browser.newPage();
try {
  page.setDefaultTimeout(TIMEOUT_MS);
  page.on("response", response => {
    const url = response.url();
    if (!url.startsWith(hsUrl)) return;
    result.calls += 1;
    const path = url.slice(hsUrl.length);
    const method = response.request().method();
    if (method === "OPTIONS" || response.status() < 400) return;
    if (EXPECTED_FAILURES.some(re => re.test(path.split("?")[0]))) return;
    result.failed_calls.push(`${method} ${path} -> ${response.status()}`);
  });
  page.on("requestfailed", request => {
    if (request.url().startsWith(hsUrl)) {
      result.failed_calls.push(`${request.method()} ${request.url().slice(hsUrl.length)} -> ${request.failure()?.errorText}`);
    }
  });
  page.on("console", message => {
    if (message.type() === "error") result.console_errors.push(message.text().slice(0, 300));
  });
  page.on("pageerror", error => result.console_errors.push(String(error).slice(0, 300)));

  // Before its first login the UI looks for its settings in the server's
  // .well-known over https; the test server speaks plain HTTP, and a TLS
  // handshake sent to it waits for its idle timeout: refuse it at once, as
  // a server without TLS on that port would.
  const hsHost = new URL(hsUrl).host;
  await page.route(`https://${hsHost}/**`, route => route.abort("connectionrefused"));

  // Login.
  await page.goto(uiUrl);
  await page.locator('input[name="username"]').fill(adminUser);
  await page.locator('input[name="password"]').fill(password);
  await page.locator('button[type="submit"]').first().click();
  // The users list (the first page after login) shows the user made for it.
  await page.getByText(userId).first().waitFor();
  result.pages.users = await page.locator("table tbody tr").count();

  // Search the users list by name.
  await page.goto(`${uiUrl}#/users?filter=${encodeURIComponent(JSON.stringify({ name: userId.slice(1, 4) }))}`);
  await page.getByText(userId).first().waitFor();
  result.pages.users_search = await page.locator("table tbody tr").count();

  // A user's page, each of its tabs.
  const userPage = `${uiUrl}#/users/${encodeURIComponent(userId)}`;
  await page.goto(userPage);
  await page.locator(`input[value="${userId}"], :text("${userId}")`).first().waitFor();
  result.pages.user = true;
  result.pages.user_tabs = [];
  for (const tab of ["devices", "connections", "media", "rooms", "memberships", "pushers", "experimental", "limits", "accountdata"]) {
    await page.goto(`${userPage}/${tab}`);
    await page.waitForLoadState("networkidle");
    result.pages.user_tabs.push(tab);
  }

  // A server notice, through the user page's dialog.
  await page.goto(userPage);
  await page.getByRole("button", { name: "Send server notices" }).click();
  await page.locator('textarea[name="body"]').fill("Sent from the admin UI");
  await page.getByRole("button", { name: "Send note" }).click();
  await page.getByRole("dialog").waitFor({ state: "detached" });
  await page.waitForLoadState("networkidle");
  result.pages.server_notice = true;

  // The rooms list and a room's page.
  await page.goto(`${uiUrl}#/rooms`);
  await page.getByText(roomName).first().waitFor();
  result.pages.rooms = await page.locator("table tbody tr").count();
  await page.getByText(roomName).first().click();
  await page.getByText(roomName).first().waitFor();
  await page.waitForURL(/#\/rooms\/[^/]+\/show/);
  result.pages.room = true;

  // Event reports.
  await page.goto(`${uiUrl}#/reports`);
  await page.getByText(roomName).first().waitFor();
  result.pages.reports = await page.locator("table tbody tr").count();

  // A registration token, through its form.
  await page.goto(`${uiUrl}#/registration_tokens/create`);
  await page.locator('input[name="token"]').fill("browser-token");
  await page.getByRole("button", { name: "Save" }).click();
  await page.waitForURL(/#\/registration_tokens$/);
  await page.getByText("browser-token").first().waitFor();
  result.pages.registration_token = true;
  // Let the last page's calls finish.
  await page.waitForLoadState("networkidle");
} catch (error) {
  result.error = String(error).slice(0, 2000);
  result.url = page.url();
  result.text = (await page.locator("body").innerText().catch(() => "")).slice(0, 1500);
  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));

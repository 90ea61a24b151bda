// Drives `aptix console` in headless Chromium, as an operator would: signs in as admin, opens
// the sessions page,
// the session and one of its turns, the queues page, then replays one dead letter by typing the
// admin token into its form and pressing "replay", and looks at the charts (the turn's
// waterfall, spend per tenant on the budgets page). Prints one JSON line of what it saw.
//
//   node replay.mjs BASE_URL SESSION_ID TURN_ID DEAD_ID TOKEN [SCREENSHOT_DIR]
//
// The browser is the OS package's (APTIX_CHROMIUM, else /usr/bin/chromium).
import puppeteer from 'puppeteer-core';

const [base, session, turn, deadId, token, shots] = process.argv.slice(2);
if (!token) {
  console.error('usage: node replay.mjs BASE_URL SESSION_ID TURN_ID DEAD_ID TOKEN [SCREENSHOT_DIR]');
  process.exit(2);
}

const browser = await puppeteer.launch({
  executablePath: process.env.APTIX_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  // Root in a container has no user namespace for Chromium's sandbox.
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
const seen = {};
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  // The console asks for a sign-in (HTTP Basic): the operator signs in as admin.
  await page.authenticate({ username: 'admin', password: token });
  const visit = async (name, path) => {
    const response = await page.goto(base + path, { waitUntil: 'load' });
    seen[name] = { status: response.status(), title: await page.title() };
    if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: false });
  };

  await visit('sessions', `/sessions?q=${encodeURIComponent(session)}`);
  seen.sessions.listed = await page.$(`a[href="/sessions/${session}"]`) !== null;
  await page.click(`a[href="/sessions/${session}"]`);
  await page.waitForSelector('h1');
  seen.session = { title: await page.title() };
  await page.click(`a[href="/sessions/${session}/turns/${turn}"]`);
  await page.waitForSelector('table.timeline');
  seen.turn = {
    title: await page.title(),
    timeline: await page.$$eval('table.timeline tr', (rows) => rows.length - 1),
    context: await page.$('pre.context') !== null,
    // The waterfall: a work bar per stage of each step, drawn (a box with a size on the page).
    waterfall_bars: await page.$$eval('svg.waterfall rect.work', (bars) =>
      bars.filter((b) => b.getBoundingClientRect().width > 0).length),
    waterfall_height: await page.$eval('svg.waterfall', (svg) => svg.getBoundingClientRect().height).catch(() => 0),
  };
  if (shots) await page.screenshot({ path: `${shots}/turn.png`, fullPage: false });

  await visit('queues', '/queues');
  const form = `section[id="dead-${deadId}"] form[action="/dead/replay"]`;
  seen.queues.dead_listed = await page.$(form) !== null;
  await page.type(`${form} input[name="token"]`, token);
  await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click(`${form} button`)]);
  seen.after = {
    url: page.url(),
    notice: await page.$eval('p.notice', (p) => p.textContent).catch(() => null),
    still_listed: await page.$(form) !== null,
  };
  // Refreshing the answer must not replay again (the action log is read below).
  await page.reload({ waitUntil: 'load' });
  seen.after.notice_on_reload = await page.$eval('p.notice', (p) => p.textContent).catch(() => null);
  await visit('actions', '/actions');
  seen.actions.rows = await page.$$eval('table tr', (rows) => rows.slice(1).map((r) => r.textContent));
  await visit('budgets', '/budgets');
  // Bars the browser drew: a box with a size on the page, not only an element in the document.
  seen.budgets.bars = await page.$$eval('svg.spend rect.day', (bars) =>
    bars.filter((b) => b.getBoundingClientRect().height > 0).map((b) => b.textContent));
  seen.budgets.legend = await page.$$eval('svg.spend text', (texts) =>
    texts.filter((t) => t.getBoundingClientRect().width > 0).map((t) => t.textContent));
  seen.budgets.width = await page.$eval('svg.spend', (svg) => svg.getBoundingClientRect().width).catch(() => 0);
  // An evaluation: the list, then the first run's arms side by side.
  await visit('evals', '/evals');
  await Promise.all([page.waitForNavigation({ waitUntil: 'load' }), page.click('a[href^="/evals/"]')]);
  seen.eval = {
    title: await page.title(),
    charts: await page.$$eval('svg.arms', (svgs) => svgs.length),
    bars: await page.$$eval('svg.arms rect.arm', (bars) =>
      bars.filter((b) => b.getBoundingClientRect().height > 0).map((b) => b.textContent)),
  };
  if (shots) await page.screenshot({ path: `${shots}/eval.png`, fullPage: false });
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));

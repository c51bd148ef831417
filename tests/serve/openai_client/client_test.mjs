// The official `openai` npm library against a running `lockstep serve`
// (started by tests/cli/openai_client.sh): models.list, plain completions and
// chat, completions with logprobs 5 and chat with top_logprobs 3, each
// non-streaming and streaming, and a 400 the library raises as BadRequestError.
// Usage: node client_test.mjs BASE_URL API_KEY MODEL_NAME. Exits non-zero on the
// first failed check.
import assert from "node:assert/strict";
import OpenAI from "openai";
import { VERSION } from "openai/version";

const [baseURL, apiKey, modelName] = process.argv.slice(2);
if (!baseURL || !apiKey || !modelName) {
  console.error("usage: node client_test.mjs BASE_URL API_KEY MODEL_NAME");
  process.exit(2);
}
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, timeout: 60000, maxRetries: 0 });

// One completions position: `top` is {token: logprob} with N or N + 1
// distinct entries (the N best and the token itself); a token holding part
// of a character is named "bytes:\\xNN...".
function checkCompletionPosition(lp, i, n, what) {
  const token = lp.tokens[i];
  const value = lp.token_logprobs[i];
  const top = lp.top_logprobs[i];
  assert.equal(typeof token, "string", `${what}: tokens[${i}]`);
  assert.equal(typeof value, "number", `${what}: token_logprobs[${i}]`);
  assert.ok(value <= 0, `${what}: token_logprobs[${i}] = ${value} > 0`);
  assert.equal(typeof top, "object", `${what}: top_logprobs[${i}]`);
  const values = Object.values(top);
  assert.ok(values.length >= n && values.length <= n + 1, `${what}: ${values.length} alternatives at ${i}`);
  for (const key of Object.keys(top))
    assert.ok(!key.includes("\uFFFD") && (!key.startsWith("bytes:") || /^bytes:(\\x[0-9a-f]{2})+$/.test(key)),
              `${what}: alternative named ${JSON.stringify(key)} at ${i}`);
  assert.ok(token in top, `${what}: the sampled token is among its alternatives at ${i}`);
  const best = Math.max(...values);
  assert.ok(best >= value, `${what}: the best alternative ${best} < the sampled token's ${value} at ${i}`);
}

// One chat position: exactly N alternatives, best first, each {token, logprob, bytes}.
function checkChatPosition(entry, n, what) {
  assert.equal(typeof entry.token, "string", what);
  assert.ok(Array.isArray(entry.bytes), `${what}: bytes`);
  assert.equal(entry.top_logprobs.length, n, `${what}: ${entry.top_logprobs.length} alternatives`);
  for (let k = 0; k < n; ++k) {
    const alt = entry.top_logprobs[k];
    assert.equal(typeof alt.token, "string", `${what}: alternative ${k} token`);
    assert.equal(typeof alt.logprob, "number", `${what}: alternative ${k} logprob`);
    assert.ok(Array.isArray(alt.bytes), `${what}: alternative ${k} bytes`);
    if (k > 0) assert.ok(alt.logprob <= entry.top_logprobs[k - 1].logprob, `${what}: alternatives out of order`);
  }
  assert.ok(entry.top_logprobs[0].logprob >= entry.logprob, `${what}: top-1 below the sampled token`);
}

async function models() {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, modelName);
  assert.equal(list.data[0].object, "model");
}

async function plainCalls() {
  const c = await client.completions.create({ model: modelName, prompt: "Hello", max_tokens: 8, temperature: 0 });
  assert.equal(c.object, "text_completion");
  assert.equal(typeof c.choices[0].text, "string");
  assert.equal(c.choices[0].logprobs, null);
  assert.ok(c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 8);
  const chat = await client.chat.completions.create({
    model: modelName,
    messages: [{ role: "user", content: "Hi there" }],
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(typeof chat.choices[0].message.content, "string");
}

async function completionsLogprobs() {
  const body = { model: modelName, prompt: "Once upon a time", max_tokens: 10, temperature: 0.8, seed: 7, logprobs: 5 };
  const c = await client.completions.create(body);
  const lp = c.choices[0].logprobs;
  const n = lp.tokens.length;
  assert.ok(n >= 1, "no tokens");
  assert.equal(lp.token_logprobs.length, n);
  assert.equal(lp.top_logprobs.length, n);
  assert.equal(lp.text_offset.length, n);
  for (let i = 0; i < n; ++i) checkCompletionPosition(lp, i, 5, "completions");

  // Streaming: each chunk carries its token's alternatives; together they are the answer's.
  const stream = await client.completions.create({ ...body, stream: true });
  let text = "";
  const streamed = { tokens: [], token_logprobs: [], top_logprobs: [] };
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      text += choice.text;
      if (!choice.logprobs) continue;
      streamed.tokens.push(...choice.logprobs.tokens);
      streamed.token_logprobs.push(...choice.logprobs.token_logprobs);
      streamed.top_logprobs.push(...choice.logprobs.top_logprobs);
    }
  }
  assert.equal(text, c.choices[0].text);
  assert.deepEqual(streamed.tokens, lp.tokens);
  assert.deepEqual(streamed.token_logprobs, lp.token_logprobs);
  assert.deepEqual(streamed.top_logprobs, lp.top_logprobs);

  // echo: the prompt's tokens first, the first without a logprob.
  const e = await client.completions.create({ ...body, echo: true, max_tokens: 3 });
  const elp = e.choices[0].logprobs;
  assert.ok(e.choices[0].text.startsWith("Once upon a time"));
  assert.equal(elp.token_logprobs[0], null);
  assert.equal(elp.top_logprobs[0], null);
  for (let i = 1; i < elp.tokens.length; ++i) checkCompletionPosition(elp, i, 5, "echo");
}

async function chatTopLogprobs() {
  const body = {
    model: modelName,
    messages: [{ role: "user", content: "What is 2+2?" }],
    max_tokens: 10,
    temperature: 0.7,
    seed: 11,
    logprobs: true,
    top_logprobs: 3,
  };
  const chat = await client.chat.completions.create(body);
  const content = chat.choices[0].logprobs.content;
  assert.ok(content.length >= 1);
  assert.equal(content.length, chat.usage.completion_tokens);
  content.forEach((entry, i) => checkChatPosition(entry, 3, `chat position ${i}`));

  const stream = await client.chat.completions.create({ ...body, stream: true });
  let text = "";
  const streamed = [];
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (choice.delta?.content) text += choice.delta.content;
      if (choice.logprobs?.content) streamed.push(...choice.logprobs.content);
    }
  }
  assert.equal(text, chat.choices[0].message.content);
  assert.deepEqual(streamed, content);
}

async function badRequest() {
  await assert.rejects(
    client.completions.create({ model: modelName, prompt: "a", max_tokens: 2, logprobs: 21 }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && /logprobs/.test(err.message),
  );
}

const checks = { models, plainCalls, completionsLogprobs, chatTopLogprobs, badRequest };
for (const [name, check] of Object.entries(checks)) {
  try {
    await check();
    console.log(`ok   ${name}`);
  } catch (err) {
    console.error(`FAIL ${name}: ${err.stack || err}`);
    process.exit(1);
  }
}
console.log(`openai ${VERSION}: all ${Object.keys(checks).length} checks passed`);

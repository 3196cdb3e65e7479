// A TypeScript/JavaScript agent using memq over plain `fetch` (Node 18+, Deno, Bun, browsers):
// no SDK, no dependency. One turn: read the memory block, answer, hand the turn over.
//
//   MEMQ_URL=http://127.0.0.1:8790 MEMQ_API_KEY=memq_... \
//     node examples/typescript/agent.mjs app1-alice "I moved to Lisbon last month."
//
// memq never makes the agent wait: the hand-off answers 202 as soon as Redis holds the turn,
// and every memq call here fails open (no memory this turn) instead of breaking the reply.

const MEMQ_URL = process.env.MEMQ_URL ?? "http://127.0.0.1:8790";
const MEMQ_API_KEY = process.env.MEMQ_API_KEY ?? "";
const TIMEOUT_MS = 2000;

/**
 * One call to memq: JSON in, JSON out; an error answer is `application/problem+json`.
 * @param {string} method
 * @param {string} path
 * @param {unknown} [body]
 * @returns {Promise<any>}
 */
async function memq(method, path, body) {
  const response = await fetch(MEMQ_URL + path, {
    method,
    headers: {
      Authorization: `Bearer ${MEMQ_API_KEY}`,
      "Content-Type": "application/json",
    },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(TIMEOUT_MS),
  });
  const data = await response.json();
  if (!response.ok) {
    // {type, title, status, detail}: `detail` is one line saying what is wrong.
    throw new Error(`memq ${response.status}: ${data.detail}`);
  }
  return data;
}

/**
 * The `<user_memory>` block to put before the user's message ("" when memq has nothing or is
 * unreachable).
 * @param {string} userId
 * @param {string} query
 * @returns {Promise<string>}
 */
export async function memoryBlock(userId, query) {
  try {
    const { block } = await memq("POST", `/v1/users/${encodeURIComponent(userId)}/context`, {
      query,
      max_tokens: 800,
    });
    return block;
  } catch (error) {
    console.error(`memory unavailable this turn: ${error.message}`);
    return "";
  }
}

/**
 * Hand the turn over; `flush: true` before a summary drops messages (extracted on the next tick).
 * @param {string} userId
 * @param {string} threadId
 * @param {{role: string, content: string}[]} messages
 * @param {boolean} [flush]
 * @returns {Promise<string>} "queued", "spooled", "nothing_to_remember" or "failed"
 */
export async function handOff(userId, threadId, messages, flush = false) {
  try {
    const accepted = await memq("POST", `/v1/users/${encodeURIComponent(userId)}/conversations`, {
      thread_id: threadId,
      messages,
      flush,
    });
    return accepted.status;
  } catch (error) {
    console.error(`turn not handed to memq: ${error.message}`);
    return "failed";
  }
}

/**
 * Your model goes here; this stand-in only shows what it would be given.
 * @param {string} system
 * @param {string} userMessage
 */
function answer(system, userMessage) {
  const known = system.includes("<user_memory>") ? "I remember a few things about you." : "";
  return `${known} You said: ${userMessage}`.trim();
}

async function main() {
  const [userId = "default", userMessage = "Hello!"] = process.argv.slice(2);
  const threadId = process.env.THREAD_ID ?? "ts-agent-thread";
  const block = await memoryBlock(userId, userMessage);
  const system = ["You are a helpful assistant.", block].filter(Boolean).join("\n\n");
  const reply = answer(system, userMessage);
  const status = await handOff(
    userId,
    threadId,
    [
      { role: "user", content: userMessage },
      { role: "assistant", content: reply },
    ],
    process.env.FLUSH === "1",
  );
  console.log(JSON.stringify({ block, reply, handOff: status }));
}

await main();

// The official `openai` npm package against a live server: one completion,
// one streamed completion, one refused request. Prints one JSON line.
//   NODE_PATH=.tools/node/node_modules node openai_npm_client.cjs BASE_URL MODEL [API_KEY]
const OpenAI = require('openai');

(async () => {
  const [baseURL, model, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: apiKey || 'none', maxRetries: 0 });
  const params = { model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true };
  const plain = await client.completions.create(params);
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', chunks = 0, finish = null, usage = null;
  for await (const c of stream) {
    if (c.choices.length > 0) {
      text += c.choices[0].text;
      chunks += 1;
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    if (c.usage) usage = c.usage;
  }
  let error = null;
  try {
    await client.completions.create({ ...params, max_tokens: 0 });
  } catch (e) {
    error = { status: e.status, message: e.message, type: e.type ?? null };
  }
  console.log(JSON.stringify({
    text: plain.choices[0].text, finish: plain.choices[0].finish_reason, usage: plain.usage, id: plain.id,
    stream_text: text, stream_chunks: chunks, stream_finish: finish, stream_usage: usage, error,
  }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

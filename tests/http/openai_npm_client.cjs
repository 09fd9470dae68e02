// The official `openai` npm package against a live server: one completion,
// one streamed completion, what lm-evaluation-harness sends to score text
// (echo, logprobs, max_tokens 0; one prompt and a batch of token ids), vLLM's
// prompt_logprobs, a streamed echo, one refused request. Prints one JSON line.
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
  // What lm-evaluation-harness's local-completions sends for loglikelihood:
  // the context and continuation echoed, one logprob each, nothing generated.
  const scored = await client.completions.create({ model, prompt: 'Hello world, said the', echo: true, logprobs: 1,
                                                   max_tokens: 0, temperature: 0 });
  // ... and for a batch of token-id prompts.
  const batch = await client.completions.create({ model, prompt: [[15496, 995], [464, 2068, 7586]], echo: true,
                                                  logprobs: 0, max_tokens: 0, temperature: 0 });
  // vLLM's prompt_logprobs beside a generation.
  const vllm = await client.completions.create({ ...params, max_tokens: 2, prompt_logprobs: 1 });
  // echo streamed: the prompt comes first.
  const echoStream = await client.completions.create({ ...params, max_tokens: 3, echo: true, stream: true });
  let echoText = '';
  for await (const c of echoStream) if (c.choices.length > 0) echoText += c.choices[0].text;
  let error = null;
  try {
    await client.completions.create({ ...params, max_tokens: 0 });
  } catch (e) {
    error = { status: e.status, message: e.message, type: e.type ?? null };
  }
  console.log(JSON.stringify({
    text: plain.choices[0].text, finish: plain.choices[0].finish_reason, usage: plain.usage, id: plain.id,
    stream_text: text, stream_chunks: chunks, stream_finish: finish, stream_usage: usage, error,
    scored_text: scored.choices[0].text, scored_logprobs: scored.choices[0].logprobs,
    scored_finish: scored.choices[0].finish_reason, scored_usage: scored.usage,
    batch: batch.choices.map((c) => ({ text: c.text, logprobs: c.logprobs })),
    vllm_text: vllm.choices[0].text, vllm_prompt_logprobs: vllm.choices[0].prompt_logprobs ?? null,
    echo_stream_text: echoText,
  }));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});

// Drives an MCP server with the TypeScript SDK's client, as Claude Code and the MCP Inspector
// do, for many tool calls in one process (one spawn instead of one per call).
//
// Usage: node calls.mjs '<plan as JSON>'
//   plan: {"stdio": {"command", "args", "env", "cwd"}} or {"url", "headers"},
//         plus "calls": [{"name", "arguments"}, ...]
// Prints one JSON array: per call {"result": ...} as the SDK returned it (after it checked
// the structured content against the tool's output schema), or {"error": message} when the
// SDK threw. tools/list runs first, so the SDK knows every output schema.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(process.argv[2]);
const transport = plan.stdio
  ? new StdioClientTransport({ ...plan.stdio, stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: plan.headers ?? {} },
    });
const client = new Client({ name: "awl-ts-calls", version: "1.0.0" });
await client.connect(transport);
await client.listTools();
const out = [];
for (const call of plan.calls) {
  try {
    out.push({ result: await client.callTool({ name: call.name, arguments: call.arguments ?? {} }) });
  } catch (error) {
    out.push({ error: error instanceof Error ? error.message : String(error) });
  }
}
await client.close();
process.stdout.write(JSON.stringify(out));

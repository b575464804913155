// A Foxglove client nobody in this project wrote: Foxglove's own WebSocket client (@foxglove/ws-protocol
// over ws) and ROS 2 decoders (@foxglove/rosmsg parses each channel's ros2msg schema,
// @foxglove/rosmsg2-serialization reads and writes CDR). test/runtime/test_foxglove.py runs it against
// foxglove_bridge_node:
//
//   node client.js ws://127.0.0.1:PORT SECONDS "an instruction"
//
// It subscribes to every advertised channel and decodes every message with that channel's schema,
// advertises /edge_llm/instruction (std_msgs/msg/String, cdr) and publishes the instruction until the
// first /edge_llm/response chunk of it comes back, then collects that request's chunks until `done`;
// it also advertises /cmd_vel, which the bridge must refuse. It prints one JSON object and exits.
"use strict";
const { FoxgloveClient } = require("@foxglove/ws-protocol");
const { WebSocket } = require("ws");
const { parse } = require("@foxglove/rosmsg");
const { MessageReader, MessageWriter } = require("@foxglove/rosmsg2-serialization");

const [url, seconds, instruction] = process.argv.slice(2);
// foxglove-sdk 0.30 speaks foxglove.sdk.v1 (the frames of foxglove.websocket.v1, this client's default)
const client = new FoxgloveClient({ ws: new WebSocket(url, ["foxglove.sdk.v1"]) });
const channels = new Map(); // channel id -> { topic, schemaName, reader }
const subscriptions = new Map(); // subscription id -> channel id
const out = {
  serverInfo: null, channels: [], decoded: {}, fields: {}, failures: [], statuses: [], diagnostics: {}, response: { id: "", text: "", done: false, status: -1 },
  sent: 0, errors: [],
};
let instructionChannel = null;
const writer = new MessageWriter(parse("string data", { ros2: true }));

client.on("error", (error) => out.errors.push(String(error && error.message ? error.message : error)));
client.on("serverInfo", (info) => {
  out.serverInfo = { name: info.name, capabilities: info.capabilities, supportedEncodings: info.supportedEncodings };
  if ((info.capabilities || []).includes("clientPublish")) {
    instructionChannel = client.advertise({ topic: "/edge_llm/instruction", encoding: "cdr", schemaName: "std_msgs/msg/String",
                                            schema: "string data", schemaEncoding: "ros2msg" });
    client.advertise({ topic: "/cmd_vel", encoding: "cdr", schemaName: "geometry_msgs/msg/Twist", schema: "", schemaEncoding: "ros2msg" });
  }
});
client.on("status", (status) => out.statuses.push({ level: status.level, message: status.message }));
client.on("advertise", (advertised) => {
  for (const channel of advertised) {
    out.channels.push({ id: channel.id, topic: channel.topic, encoding: channel.encoding, schemaName: channel.schemaName,
                        schemaEncoding: channel.schemaEncoding });
    let reader = null;
    try {
      reader = new MessageReader(parse(channel.schema, { ros2: true }));
    } catch (error) {
      out.failures.push({ topic: channel.topic, stage: "schema", error: String(error) });
    }
    channels.set(channel.id, { topic: channel.topic, schemaName: channel.schemaName, reader });
    subscriptions.set(client.subscribe(channel.id), channel.id);
  }
});
client.on("message", ({ subscriptionId, data }) => {
  const channel = channels.get(subscriptions.get(subscriptionId));
  if (!channel || !channel.reader) return;
  let message;
  try {
    message = channel.reader.readMessage(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  } catch (error) {
    out.failures.push({ topic: channel.topic, stage: "decode", error: String(error) });
    return;
  }
  out.decoded[channel.topic] = (out.decoded[channel.topic] || 0) + 1;
  if (!out.fields[channel.topic]) out.fields[channel.topic] = Object.keys(message);
  if (channel.topic === "/diagnostics") {
    for (const status of message.status) out.diagnostics[status.name] = { level: status.level, hardware_id: status.hardware_id, message: status.message };
  } else if (channel.topic === "/edge_llm/response") {
    const response = out.response;
    if (!response.id) response.id = message.request_id;
    if (message.request_id === response.id && !response.done) {
      response.text += message.text;
      if (message.done) { response.done = true; response.status = message.status.code; }
    }
  }
});

const started = Date.now();
const sender = setInterval(() => { // again until the deployment answers: a new publisher may not be matched yet
  if (instructionChannel !== null && !out.response.id) {
    client.sendMessage(instructionChannel, writer.writeMessage({ data: instruction }));
    out.sent += 1;
  }
}, 2000);
const watcher = setInterval(() => {
  const enough = out.response.done && Object.keys(out.diagnostics).length > 0 && Date.now() - started > 3000;
  if (enough || Date.now() - started > Number(seconds) * 1000) {
    clearInterval(sender);
    clearInterval(watcher);
    console.log(JSON.stringify(out));
    client.close();
    process.exit(0);
  }
}, 200);

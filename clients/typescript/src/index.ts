/**
 * Aptix Orchestrator client (protocol v3): sessions, requests and typed reply events over
 * RabbitMQ, for Node.
 */
export * from "./protocol";
export * from "./events";
export * from "./schemas";
export * from "./client";

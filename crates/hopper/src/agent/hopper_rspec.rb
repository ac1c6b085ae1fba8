# hopper's RSpec agent (see docs/agent-protocol.md); filled in with the agents.

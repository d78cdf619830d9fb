package server

import "github.com/sluicehq/sluice/internal/wire"

// EscapeChar is the line protocol's reserved first character (docs/protocol.md); the
// protocol's codec is package internal/wire, shared with the client.
const EscapeChar = wire.EscapeChar

// Package peer lets the nodes that stage the same dataset version read it from each other instead
// of each reading it from the source (docs/datasets.md, "Peer fan-out").
//
// A node serves, over HTTPS on its peer port, what it holds of a dataset version: the entries of
// a ready dataset, and while it is still staging the entries it has verified and the byte ranges
// of large entries it read from the source itself. A fetcher asks for a version by its manifest
// digest, which it learned from its own listing of the source with the tenant's credentials: a
// node that never listed the source cannot name the version. Small entries are asked for many at
// a time, in batch requests (protocol.go).
//
// Peers trust nothing they receive from each other: the fetcher checks every byte against the
// checksums its own listing and the source's headers gave (package datasource), drops a peer that
// served a wrong byte and reads the piece again from another peer or the source.
//
// Authentication (docs/security.md): the client presents a bound ServiceAccount token with the
// audience "cistern-peer" that the server checks with TokenReview (authenticated, the audience,
// the node plugin's ServiceAccount, bound to a pod scheduled to a node); the server presents a
// self-signed certificate whose SHA-256 the node publishes with its endpoint on its StoragePools,
// and the client accepts no other.
package peer

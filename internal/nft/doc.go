// Package nft opens the nftables connections kelp programs its tables
// with. google/nftables sends a whole batch in one message and asks the
// kernel to acknowledge every part of it, so a table of a few hundred
// Services overflows a netlink socket of the default size; the
// connections here have buffers that fit the largest batches kelp sends.
package nft

package pki

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrCAHashMismatch is a server CA bundle that a join token's hash does not
// name.
var ErrCAHashMismatch = errors.New("the server's CA does not match the token's hash")

// PinnedCA returns, as PEM, the part of a server CA bundle (as /cacerts
// serves it, unverified) that hash (a join token's) vouches for: the whole
// bundle when hash is CAHash of it, as tokens made from the current file
// are; otherwise the certificate whose own CAHash it is, plus every CA
// certificate of the bundle that the key of a certificate vouched for
// signed, and so on.
//
// During a CA rotation the bundle is the new CA, its copy cross-signed by
// the old CA, and the old CA, which tokens from before the rotation name.
// The old CA's key signed the cross-signed copy, whose key (the new CA's)
// signed the new CA: the whole bundle comes back, so that the node trusts
// the new CA after --finish as well. A certificate that no vouched-for key
// signed, such as a CA that something between the node and the server
// added, is left out, as is anything that is not a CA.
func PinnedCA(bundle []byte, hash string) ([]byte, error) {
	certs, err := parseCerts(bundle)
	if err != nil {
		return nil, fmt.Errorf("no CA certificate: %w", err)
	}
	if CAHash(bundle) == hash {
		return bundle, nil
	}
	vouched := make([]bool, len(certs))
	pinned := false
	for i, c := range certs {
		sum := sha256.Sum256(encodeCert(c.Raw))
		if hex.EncodeToString(sum[:]) == hash {
			vouched[i], pinned = true, true
			break
		}
	}
	if !pinned {
		return nil, ErrCAHashMismatch
	}
	// CheckSignatureFrom checks that the signer is a CA; validity periods
	// do not matter here: the TLS handshake checks those with the clock.
	for grew := true; grew; {
		grew = false
		for i, c := range certs {
			if vouched[i] || !c.BasicConstraintsValid || !c.IsCA {
				continue
			}
			for j, signer := range certs {
				if vouched[j] && c.CheckSignatureFrom(signer) == nil {
					vouched[i], grew = true, true
					break
				}
			}
		}
	}
	var out []byte
	for i, c := range certs {
		if vouched[i] {
			out = append(out, encodeCert(c.Raw)...)
		}
	}
	return out, nil
}

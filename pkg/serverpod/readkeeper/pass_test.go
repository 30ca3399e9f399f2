package readkeeper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/blob/filesystem"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/readkeeper"
)

// entry is a manifest as a reader sees it: metadata and payload.
type entry struct {
	Meta    manifest.EntryMetadata
	Payload json.RawMessage
}

// allManifests reads every live manifest of r.
func allManifests(ctx context.Context, r repo.Repository) map[manifest.ID]entry {
	GinkgoHelper()
	Expect(r.Refresh(ctx)).To(Succeed())
	metas, err := r.FindManifests(ctx, nil)
	Expect(err).NotTo(HaveOccurred())
	all := map[manifest.ID]entry{}
	for _, m := range metas {
		var payload json.RawMessage
		_, err := r.GetManifest(ctx, m.ID, &payload)
		Expect(err).NotTo(HaveOccurred())
		m.ModTime = m.ModTime.UTC()
		all[m.ID] = entry{Meta: *m, Payload: payload}
	}
	return all
}

// blobs counts the storage's blobs by the first letter of their IDs (Kopia's
// blob kinds: "q" metadata packs, "x" indexes, "s" session markers, ...).
func blobs(r repo.Repository) map[string]int {
	GinkgoHelper()
	cfg, ok := r.(repo.DirectRepository).BlobReader().ConnectionInfo().Config.(*filesystem.Options)
	Expect(ok).To(BeTrue(), "a filesystem repository")
	counts := map[string]int{}
	Expect(filepath.WalkDir(cfg.Path, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".f") {
			return err
		}
		rel, err := filepath.Rel(cfg.Path, path)
		if err != nil {
			return err
		}
		counts[rel[:1]]++
		return nil
	})).To(Succeed())
	return counts
}

var _ = Describe("A pass", func() {
	var (
		ctx context.Context
		r   repo.Repository
	)

	BeforeEach(func() {
		ctx = context.Background()
		r = testbed.NewRepository(GinkgoT())
	})

	// flushes writes n sessions of manifests, each flushing one manifest
	// content: perSession snapshot-like manifests, and the replacement of
	// the one policy, so that the contents hold deleted entries too.
	flushes := func(n, perSession int) {
		GinkgoHelper()
		for s := range n {
			Expect(repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "spec"}, func(ctx context.Context, w repo.RepositoryWriter) error {
				for i := range perSession {
					labels := map[string]string{"type": "snapshot", "username": fmt.Sprintf("vm%d", i), "hostname": "ns"}
					if _, err := w.PutManifest(ctx, labels, map[string]any{"session": s, "i": i, "rootEntry": strings.Repeat("k", 64)}); err != nil {
						return err
					}
				}
				_, err := w.ReplaceManifests(ctx, map[string]string{"type": "policy", "policyType": "global"}, map[string]any{"session": s})
				return err
			})).To(Succeed())
		}
	}

	It("compacts at the Keeper's threshold without changing any manifest, at the cost it says", func() {
		flushes(readkeeper.Threshold, 50)
		before := allManifests(ctx, r)
		Expect(before).To(HaveLen(readkeeper.Threshold*50 + 1))
		blobsBefore := blobs(r)

		res, err := readkeeper.Pass(ctx, r.(repo.DirectRepository))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Compacted).To(BeTrue())
		Expect(res.Before).To(HaveLen(readkeeper.Threshold))
		Expect(res.After).To(HaveLen(1))
		blobsAfter := blobs(r)
		GinkgoLogr.Info("compaction", "manifests", len(before), "contentsBefore", len(res.Before), "bytesBefore", res.BytesBefore,
			"bytesAfter", res.BytesAfter, "blobsBefore", blobsBefore, "blobsAfter", blobsAfter)

		Expect(allManifests(ctx, r)).To(Equal(before), "every manifest, its labels, time and payload, as before")
		// One metadata pack, one index blob, one session marker (Kopia
		// removes the marker when the session ends).
		Expect(blobsAfter["q"]).To(Equal(blobsBefore["q"] + 1))
		Expect(blobsAfter["x"] - blobsBefore["x"]).To(BeNumerically("<=", 1))
		Expect(res.BytesAfter).To(BeNumerically("<", res.BytesBefore))
	})

	It("writes nothing below the threshold", func() {
		flushes(readkeeper.Threshold-1, 1)
		blobsBefore := blobs(r)
		res, err := readkeeper.Pass(ctx, r.(repo.DirectRepository))
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Compacted).To(BeFalse())
		Expect(res.After).To(Equal(res.Before))
		Expect(blobs(r)).To(Equal(blobsBefore))
	})
})

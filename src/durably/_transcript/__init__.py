"""The transcript machinery: how a run's history stays linear in its length.

The failure it prevents: an agent loop that sends its whole transcript to
the model activity on every turn stores the transcript in history again
each turn, so history grows with the square of the run's length and long
runs die at Temporal's history limit. Here a model request carries only
the messages added since the previous request, results of activities
travel as references (`MessageRef`), and the model activity rebuilds the
rest on its worker. History grows by each turn's own data, once.

`digest`: the running transcript digest (`EMPTY_DIGEST`, `extend_digest`),
which the workflow sends with every request and a rebuilt transcript must
match, and `encoded_size`, what a message costs in a payload. The digest
is in every history: its encoding never changes.

`cache`: `TranscriptCache`, each worker's transcripts and activity outputs
per run, bounded by bytes; a hit rebuilds a transcript without any call.

`pages`: `transcript_page`, the workflow's `transcript` query and the
restore activity's answer, split into pages that stay under the 2 MB
payload limit.

`rebuild`: what the model and restore activities call to turn a request's
`base_length`/`new`/`digest` into the full message list, from the cache or
(on a miss) by querying the workflow, with the errors that say why not.

The wire types (`MessageRef`, `TranscriptPage`, `TranscriptArchive`,
`TranscriptRestoreRequest`) are stored in histories and live in
`durably.contract` with the other activity inputs; they are re-exported
here for reading beside their users.
"""

from durably._transcript.cache import DEFAULT_MAX_BYTES, TranscriptCache
from durably._transcript.digest import (
    EMPTY_DIGEST,
    SHORT_DIGEST,
    encoded_size,
    extend_digest,
    proves,
    transcript_digest,
)
from durably._transcript.pages import PAGE_BYTES, transcript_page
from durably._transcript.rebuild import (
    conversation,
    model_transcript,
    rebuild_transcript,
    restored_transcript,
)
from durably.contract import (
    MessageRef,
    TranscriptArchive,
    TranscriptPage,
    TranscriptRestoreRequest,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EMPTY_DIGEST",
    "PAGE_BYTES",
    "SHORT_DIGEST",
    "MessageRef",
    "TranscriptArchive",
    "TranscriptCache",
    "TranscriptPage",
    "TranscriptRestoreRequest",
    "conversation",
    "encoded_size",
    "extend_digest",
    "model_transcript",
    "proves",
    "rebuild_transcript",
    "restored_transcript",
    "transcript_digest",
    "transcript_page",
]

//! The one cursor pager: every paged listing (engine `list`, roots, staged
//! rows) is "fetch the page after this cursor, until a short page".

use std::future::Future;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::Result;

/// Streams items fetched `page_size` at a time. `fetch(after)` returns the
/// items after cursor `after` (`None`: from the start), ascending; `cursor`
/// names an item's position. A page shorter than `page_size` ends the
/// stream without another round trip; an error ends it after being yielded.
pub(crate) fn paged<'a, T, C, F, Fut>(
    page_size: usize,
    cursor: fn(&T) -> C,
    fetch: F,
) -> BoxStream<'a, Result<T>>
where
    T: Send + 'a,
    C: Send + 'a,
    F: FnMut(Option<C>) -> Fut + Send + 'a,
    Fut: Future<Output = Result<Vec<T>>> + Send + 'a,
{
    let pages = futures::stream::unfold(
        (fetch, Some(None::<C>)),
        move |(mut fetch, state)| async move {
            let after = state?;
            match fetch(after).await {
                Err(e) => Some((vec![Err(e)], (fetch, None))),
                Ok(page) if page.is_empty() => None,
                Ok(page) => {
                    let next = (page.len() >= page_size)
                        .then(|| page.last().map(|t| Some(cursor(t))))
                        .flatten();
                    Some((page.into_iter().map(Ok).collect::<Vec<_>>(), (fetch, next)))
                }
            }
        },
    );
    Box::pin(pages.flat_map(futures::stream::iter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    #[tokio::test]
    async fn pages_until_a_short_page_and_passes_errors_through() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = calls.clone();
        let all: Vec<u32> = paged(
            3,
            |x: &u32| *x,
            move |after: Option<u32>| {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let start = after.map_or(0, |a| a + 1);
                    Ok((start..10.min(start + 3)).collect())
                }
            },
        )
        .try_collect()
        .await
        .unwrap();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        // 0-2, 3-5, 6-8, then 9 (a short page): four fetches, no fifth.
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);

        let failing: Vec<Result<u32>> = paged(
            3,
            |x: &u32| *x,
            |_after: Option<u32>| async { Err(crate::Error::Config("boom".into())) },
        )
        .collect()
        .await;
        assert_eq!(failing.len(), 1);
        assert!(failing[0].is_err());
    }
}

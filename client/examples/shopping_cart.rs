//! A shopping cart: carts that expire after a quiet spell (sliding expiry), line items added
//! by a patch that creates the cart if needed, an add that is retried safely after a timeout
//! (idempotency key), checkout as a transactional batch (the order is written, never to
//! expire, and the cart deleted, together), a query for a user's orders and an order
//! consumer that fulfils each order once.
//!
//! ```text
//! cargo run -p mayfly-server --bin mayfly &          # a server on 127.0.0.1:7070
//! MAYFLY_KEY=$(cat mayfly-data/keys/primary) cargo run -p mayfly-client --example shopping_cart -- 127.0.0.1:7070
//! ```
//! Without a server address argument it starts one in-process, so it also runs on its own.

mod support;

use std::time::Duration;

use mayfly_client::{
    Client, Collection, CollectionSettings, DefaultTtl, DocumentTtl, Ensured, Error, MustLiveRule,
    PatchOps, PatchOutcome, Reason, json_pointer, new_idempotency_key,
};
use serde::Deserialize;
use serde_json::json;

/// Carts and orders of a user share a partition (`/user`), so checkout is one batch.
struct Shop {
    docs: Collection,
}

#[derive(Debug, Deserialize)]
struct Order {
    id: String,
    total_items: i64,
    status: String,
}

impl Shop {
    async fn open(client: &Client, cart_idle: Duration) -> Result<Self, Error> {
        let db = client
            .create_database_if_not_exists("shop")
            .await?
            .into_inner();
        // Every write restarts a document's TTL clock: a cart lives `cart_idle` past its last
        // change. Orders say `ttl: Never` (see checkout), and the must-live rule makes the
        // server refuse an order written without it rather than let it expire.
        let orders_live = MustLiveRule::new("/type", ["order"]);
        let ensured = db
            .create_collection_if_not_exists("docs", "/user")
            .default_ttl(DefaultTtl::After(cart_idle))
            .must_live(orders_live.clone())
            .await?;
        // Made by an older version of this program: give it the rule it lacks.
        if let Ensured::Existing(docs, info) = &ensured
            && !info.must_live.contains(&orders_live)
        {
            let settings = CollectionSettings::new(info.default_ttl).must_live([orders_live]);
            docs.replace_settings(settings).await?;
        }
        Ok(Shop {
            docs: ensured.into_inner(),
        })
    }

    /// Adds `qty` of `sku` to the user's cart, creating the cart if there is none: one call.
    /// `key` names this add: a retry with it applies nothing twice.
    async fn add(&self, user: &str, sku: &str, qty: i64, key: &str) -> Result<(), Error> {
        let cart = json!({"id": "cart", "user": user, "type": "cart", "items": {}});
        let outcome = self
            .docs
            .patch("cart", user)
            .incr(&json_pointer(["items", sku]), qty)
            .create_if_missing(&cart)
            .idempotency_key(key)
            .await?;
        assert!(
            !matches!(outcome, PatchOutcome::Missing),
            "created if missing"
        );
        Ok(())
    }

    /// The cart becomes an order, in one batch: the order is created (never to expire) and
    /// the cart deleted (if still the version read), or neither. Keyed by the order, so a
    /// retry of the batch places one order. `None`: no cart (empty, or it expired).
    async fn checkout(&self, user: &str, order_id: &str) -> Result<Option<i64>, Error> {
        let Some(cart) = self.docs.read("cart", user).await? else {
            return Ok(None);
        };
        let items = cart.body()["items"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let total: i64 = items.values().filter_map(|q| q.as_i64()).sum();
        let order = json!({"id": order_id, "user": user, "type": "order",
                           "items": items, "total_items": total, "status": "placed"});
        self.docs
            .batch(user)
            .create(&order)
            .ttl(DocumentTtl::Never)
            .delete("cart")
            .if_match(cart.etag())
            .idempotency_key(format!("checkout-{order_id}"))
            .await?;
        Ok(Some(total))
    }

    async fn orders(&self, user: &str) -> Result<Vec<Order>, Error> {
        let text = "SELECT * FROM d WHERE d.user = @user AND d.type = 'order'";
        let found = self.docs.query::<Order>(text).param("@user", user).await?;
        found.collect_all().await
    }

    /// The order consumer: fulfils placed orders, each exactly once (the condition makes a
    /// second consumer's patch of the same order fail, changing nothing).
    async fn fulfil(&self, user: &str) -> Result<usize, Error> {
        let mut fulfilled = 0;
        for order in self.orders(user).await? {
            let done = self
                .docs
                .patch(&order.id, user)
                .ops(PatchOps::new().set("/status", "fulfilled"))
                .condition("FROM d WHERE d.status = 'placed'")
                .await;
            match done {
                Ok(_) => fulfilled += 1,
                Err(e) if e.reason() == Some(&mayfly_client::Reason::ConditionNotMet) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(fulfilled)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut idle = Duration::from_secs(1800);
    let mut address = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--idle-secs" => idle = Duration::from_secs(args.next().ok_or("a value")?.parse()?),
            other => address = Some(other.to_owned()),
        }
    }
    let (client, _embedded) = support::connect(address).await?;
    let shop = Shop::open(&client, idle).await?;
    let user = format!("ann-{}", new_idempotency_key());

    shop.add(&user, "tea/green", 2, &new_idempotency_key())
        .await?;
    // An add whose answer is lost: the first try times out (maybe applied, maybe not), the
    // retry carries the same key, so the item is counted once either way.
    let key = new_idempotency_key();
    let first_try = tokio::time::timeout(Duration::from_micros(1), shop.add(&user, "mug", 1, &key));
    if let Ok(done) = first_try.await {
        done?;
    }
    shop.add(&user, "mug", 1, &key).await?;
    let cart = shop.docs.read("cart", &user).await?.expect("a cart");
    assert_eq!(cart.body()["items"], json!({"tea/green": 2, "mug": 1}));
    println!("{user}'s cart: {}", cart.body()["items"]);

    // Checkout: one order, the cart gone.
    assert_eq!(shop.checkout(&user, "order-1").await?, Some(3));
    assert_eq!(
        shop.checkout(&user, "order-1").await?,
        None,
        "the cart is gone"
    );

    // An order written without `ttl: Never` is refused, not left to expire with the carts.
    let forgot = json!({"id": "order-2", "user": &user, "type": "order"});
    let refused = shop.docs.create(&forgot).await.expect_err("must live");
    assert_eq!(refused.reason(), Some(&Reason::MustLive));

    let orders = shop.orders(&user).await?;
    assert_eq!((orders.len(), orders[0].total_items), (1, 3));
    assert_eq!(shop.fulfil(&user).await?, 1);
    assert_eq!(shop.fulfil(&user).await?, 0, "each order is fulfilled once");
    println!("{user}'s orders: {:?}", shop.orders(&user).await?);

    // A cart left alone expires; the order does not.
    shop.add(&user, "spoon", 1, &new_idempotency_key()).await?;
    if idle <= Duration::from_secs(5) {
        tokio::time::sleep(idle + Duration::from_millis(200)).await;
        assert!(
            shop.docs.read("cart", &user).await?.is_none(),
            "the idle cart expired"
        );
        assert_eq!(shop.orders(&user).await?[0].status, "fulfilled");
        println!("the idle cart expired after {idle:?}; the order stays");
    }
    Ok(())
}

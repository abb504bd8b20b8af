from normaudit.cli import main

raise SystemExit(main())
